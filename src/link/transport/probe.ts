// Phase probes on the handoff path, for `npm run bench -- --breakdown`. Nothing records unless a
// benchmark installs a recorder with setProbe(): until then every probe site is one test of an
// undefined binding (`probe?.(Probe.X)`), no call, no clock read.

/** Points on the path of one message, in the order they happen. */
export const enum Probe {
  /** link.send() entered. */
  SendStart = 1,
  /** A transfer handler's encode() (the export: e.g. cuMemPoolExportPointer) starts / ends. */
  ExportStart = 2,
  ExportEnd = 3,
  /** sendmsg() of a frame starts / returned. */
  SocketSend = 4,
  SocketSent = 5,
  /** A record arrived: the link's JS callback was entered. */
  RecordIn = 6,
  /** A transfer handler's decode() (the import: mmap, cuMemPoolImportPointer, ...) starts / ends. */
  ImportStart = 7,
  ImportEnd = 8,
  /** A message is decoded and about to be handed to receive() or a listener. */
  Delivered = 9,
  /** A RELEASE frame is about to be encoded and sent. */
  ReleaseSend = 10,
  /** A received RELEASE frame was processed: the leases it names ended (memory freed). */
  ReleaseDone = 11,
}

/** The installed recorder, or undefined (the default: probes cost one test each). */
export let probe: ((point: Probe) => void) | undefined;

/** Installs (or with undefined removes) the recorder every probe site calls. For benchmarks. */
export function setProbe(recorder: ((point: Probe) => void) | undefined): void {
  probe = recorder;
}
