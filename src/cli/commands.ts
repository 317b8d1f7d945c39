// Every `cuda-ipc` command: what it takes (for the parser and its --help) and how it runs. The
// implementations are imported when a command runs, so `--help` and `status` never load CUDA.
import type { ArgsSpec, ParsedArgs } from './args.js';

export interface CommandSpec extends ArgsSpec {
  readonly name: string;
  /** One line for the command list. */
  readonly summary: string;
  /** A paragraph for the command's own help. */
  readonly description: string;
  readonly examples: readonly string[];
  /** Exit statuses particular to this command (0/1/2 are explained for all). */
  readonly exitNotes?: string;
  run(args: ParsedArgs): Promise<number>;
}

const device = { type: 'string', value: 'D', help: 'device ordinal (default: CUDA_IPC_DEVICE where set, an ordinal or a GPU-... UUID, else 0); where there is no GPU, giving either is a usage error' } as const;
const json = { type: 'boolean', help: 'print JSON instead of text, for scripts' } as const;
const dir = { type: 'string', value: 'DIR', help: 'read the records in DIR instead of this user\'s default (see ENVIRONMENT in cuda-ipc --help)' } as const;
const tokenFile = { type: 'string', value: 'FILE', help: 'over TCP: read the shared token from FILE instead of CUDA_IPC_TOKEN (a token is never taken from the command line)' } as const;
const NO_GPU = 'Without a usable GPU it prints why and exits 0 (the CUDA samples\' convention), so scripts can tell "not here" from "failed".';
const ON_HOST = 'Without a usable GPU it says why and runs on host shared memory: 0 when it succeeds there. --device on a machine without a GPU is a usage error (2).';

export const commands: readonly CommandSpec[] = [
  {
    name: 'info',
    summary: 'devices, capabilities and driver',
    description: 'What this machine offers for GPU sharing: the driver, each device (UUID, memory, IPC pools, IPC events, ...), peer access between devices, and the NCCL library found (or where it looked). Without a driver it says why.',
    options: { json },
    positionals: [],
    examples: ['cuda-ipc info', 'cuda-ipc info --json | jq .devices[0].uuid'],
    exitNotes: 'A machine without a driver or GPU is reported, not an error: 0.',
    async run(args) {
      const { collectInfo, formatInfo } = await import('./info.js');
      const report = await collectInfo();
      console.log(args.values.json ? JSON.stringify(report, null, 2) : formatInfo(report));
      return 0;
    },
  },
  {
    name: 'status',
    summary: 'who holds what: memory, leases, links, channels of every process using cuda-ipc',
    description:
      'One snapshot of every process of this user that uses cuda-ipc: its pid and command, the device memory it allocated and how much of it ' +
      'each peer still leases, what it holds of other processes\' memory and from whom, its open links, channels (slot states and peers) ' +
      'and open file descriptors. Processes publish this in small record files (on by default; CUDA_IPC_STATUS=0 turns it off); ' +
      'reading them never disturbs the processes, and records of processes that are gone (killed, crashed) are removed.',
    options: { json, dir },
    positionals: [],
    examples: ['cuda-ipc status', 'cuda-ipc status --json | jq \'.processes[] | {pid, leasedTo}\''],
    async run(args) {
      return (await import('./status.js')).status(args);
    },
  },
  {
    name: 'top',
    summary: 'status, refreshing like top (q quits)',
    description: 'The status view, redrawn every --interval seconds until you press q (or Ctrl-C). When the output is not a terminal, it prints a snapshot per interval instead; --iterations stops after that many.',
    options: {
      interval: { type: 'string', value: 'SECONDS', help: 'time between refreshes (default 1)' },
      iterations: { type: 'string', value: 'N', help: 'stop after N refreshes (default: until q)' },
      dir,
    },
    positionals: [],
    examples: ['cuda-ipc top', 'cuda-ipc top --interval 0.5', 'cuda-ipc top --iterations 3 > log.txt'],
    async run(args) {
      return (await import('./top.js')).top(args);
    },
  },
  {
    name: 'roundtrip',
    summary: 'hand a GPU buffer to a child process and back',
    description:
      'Allocates a buffer in an IPC memory pool, fills 100, 101, ... and sends it to a spawned child, which verifies it and writes 0, -1, -2, ...; ' +
      'the parent verifies. Without a usable GPU it says why and runs the same round trip on host shared memory.',
    options: { elements: { type: 'string', value: 'N', help: 'int32 elements to share (default 1024)' }, device },
    positionals: [],
    examples: ['cuda-ipc roundtrip', 'cuda-ipc roundtrip --elements 1000000 --device 1'],
    exitNotes: ON_HOST,
    async run(args) {
      return (await import('./roundtrip.js')).roundtrip(args);
    },
  },
  {
    name: 'produce',
    summary: 'allocate, fill a pattern, write a descriptor, wait for a consumer',
    description:
      'The producer of the two-terminal example: allocates float32 device memory, fills a known pattern, writes a descriptor (JSON with a legacy IPC handle) to --out, ' +
      'waits for `cuda-ipc consume` to double the values, verifies them and removes its files. Without a usable GPU it says why and shares host shared memory ' +
      '(a memfd) instead: it listens on a link and writes the link\'s name to --out; the consumer connects and gets the memory over it. ' +
      'With --listen tcp://HOST:PORT instead of --out it serves a consumer on another machine over a TCP link: device memory moved over NCCL where both machines ' +
      'have a GPU, else host memory, copied; the consumer doubles its copy and sends it back. Both sides need the same token, from CUDA_IPC_TOKEN or --token-file.',
    options: {
      out: { type: 'string', value: 'FILE', help: 'where to write the descriptor, e.g. --out handle.json (this machine); a new file: an existing FILE or FILE.done is refused (2)' },
      force: { type: 'boolean', help: 'with --out: replace a regular file of your own at FILE (and remove one at FILE.done); never a symlink, FIFO, device or directory' },
      listen: { type: 'string', value: 'URL', help: 'serve another machine instead: listen at tcp://HOST:PORT, HOST an address of this machine (0.0.0.0: all; port 0: any free one)' },
      'token-file': tokenFile,
      elements: { type: 'string', value: 'N', help: 'float32 elements (default 1048576)' },
      device,
      timeout: { type: 'string', value: 'SECONDS', help: 'how long to wait for a consumer (default 600)' },
    },
    positionals: [],
    examples: ['cuda-ipc produce --out handle.json', 'cuda-ipc produce --out /tmp/h.json --elements 1000 --timeout 60', 'CUDA_IPC_TOKEN=$(cat ~/.cuda-ipc-token) cuda-ipc produce --listen tcp://0.0.0.0:5000'],
    exitNotes: ON_HOST,
    async run(args) {
      return (await import('./produce.js')).produce(args);
    },
  },
  {
    name: 'consume',
    summary: 'open a descriptor, verify, double in place, signal the producer',
    description:
      'The consumer of the two-terminal example: waits for FILE (the producer may start later), opens the memory it describes, verifies every element, ' +
      'doubles them in place and tells the producer (through FILE.done, or over the link when FILE describes host memory). GPU memory needs a GPU here; ' +
      'host memory (what produce shares where it has no GPU) does not. Given tcp://HOST:PORT instead of FILE, it connects to `cuda-ipc produce --listen` on ' +
      'another machine, with the same token (CUDA_IPC_TOKEN or --token-file), and gets a copy of its memory: over NCCL into its GPU (--device) where it has one, ' +
      'else in host memory.',
    options: {
      timeout: { type: 'string', value: 'SECONDS', help: 'how long to wait for FILE to appear, or for the producer to listen (default 60)' },
      'token-file': tokenFile,
      device: { ...device, help: 'over TCP: the GPU to receive device memory on (default: CUDA_IPC_DEVICE where set, else 0)' },
    },
    positionals: [{ name: 'FILE', required: true, help: 'give the descriptor file the producer writes, e.g. cuda-ipc consume handle.json, or tcp://HOST:PORT of a producer started with --listen' }],
    examples: ['cuda-ipc consume handle.json', 'cuda-ipc consume /tmp/h.json --timeout 10', 'cuda-ipc consume tcp://10.0.0.2:5000 --token-file ~/.cuda-ipc-token'],
    exitNotes: 'A FILE that does not appear within --timeout, is not a producer\'s descriptor, describes GPU memory on a machine without a usable GPU, or was left by a producer that is gone (at once, with that cause): 1.',
    async run(args) {
      return (await import('./consume.js')).consume(args);
    },
  },
  {
    name: 'token',
    summary: 'print a fresh random token for TCP links (CUDA_IPC_TOKEN)',
    description:
      'Prints 32 random bytes (base64url): a token for links between machines. Give the same one to both sides, as CUDA_IPC_TOKEN or in a file only you ' +
      'can read (--token-file of produce and consume; the token option of listen() and connect()). It never crosses the wire: each side proves it holds it.',
    options: {},
    positionals: [],
    examples: ['cuda-ipc token', 'export CUDA_IPC_TOKEN=$(cuda-ipc token)', '(umask 077; cuda-ipc token > ~/.cuda-ipc-token)'],
    async run() {
      return (await import('./tcp-handoff.js')).printToken();
    },
  },
  {
    name: 'demo',
    summary: 'events | transform | tensors: the tutorial examples (transform and tensors also without a GPU)',
    description:
      'events: a child waits on the parent\'s kernel through an interprocess event (--ms: the kernel\'s length). ' +
      'transform: a child doubles shared values with a kernel (--elements). ' +
      'tensors: a producer drops buffers right after sending them; the consumer still reads them right (--count). ' +
      'Without a usable GPU, transform and tensors run on host shared memory (saying so); events, whose point is ordering GPU work, says why it needs a GPU.',
    options: {
      ms: { type: 'string', value: 'T', help: 'events: how long the parent\'s kernel runs, in ms (default 500)' },
      elements: { type: 'string', value: 'N', help: 'transform: float32 elements (default 1048576)' },
      count: { type: 'string', value: 'N', help: 'tensors: how many buffers (default 9)' },
      device,
    },
    positionals: [{ name: 'MODE', required: true, help: "choose 'events', 'transform' or 'tensors', e.g. cuda-ipc demo events", choices: ['events', 'transform', 'tensors'] }],
    examples: ['cuda-ipc demo events --ms 1000', 'cuda-ipc demo transform --elements 4096', 'cuda-ipc demo tensors'],
    exitNotes: `transform, tensors: ${ON_HOST} events: ${NO_GPU}`,
    async run(args) {
      return (await import('./demo.js')).demo(args);
    },
  },
];

export function findCommand(name: string): CommandSpec | undefined {
  return commands.find((c) => c.name === name);
}
