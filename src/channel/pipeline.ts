// pipeline(): stages in separate processes, chained by channels. This process spawns every stage
// and is the hub of every channel (it owns the slots, watches the stages, and repairs the
// channels when one dies); stage i produces into the channel that stage i + 1 consumes.
import { IpcError } from '../errors.js';
import { parentLink, spawn, type Link, type SpawnOptions, type SpawnedChild } from '../link/index.js';
import { ChannelHub, openOwnedEnd } from './hub.js';
import type { ChannelProducer } from './producer.js';
import type { ChannelConsumer } from './consumer.js';
import { acceptChannel } from './create.js';
import type { ChannelOptions, ChannelWaitOptions, SlotBuffer } from './options.js';
import { invalidArgValue } from '../arg-errors.js';

const PROTOCOL = '@cuda-ipc/pipeline';

/** Options of pipeline(): the channels' shape and wait mode, and how the stages are started. */
export interface PipelineOptions extends Omit<ChannelOptions, 'producers' | 'consumers' | 'maxPeers'>, ChannelWaitOptions {
  /** Extra command-line arguments of each stage (by index). */
  args?: ReadonlyArray<readonly string[]>;
  /** How the stages are spawned (stdio, env, ...). */
  spawn?: SpawnOptions;
  /** This process feeds the first stage: `pipeline.input` is a producer end. */
  input?: boolean;
  /** This process reads what the last stage produces: `pipeline.output` is a consumer end. */
  output?: boolean;
}

/**
 * What pipeline() resolves with: the stage processes and this process's ends of the first and last
 * channels.
 */
export interface Pipeline extends AsyncDisposable {
  readonly stages: readonly SpawnedChild[];
  /** This process's producer end into the first stage (with `input: true`). */
  readonly input: ChannelProducer | undefined;
  /** This process's consumer end of the last stage's output (with `output: true`). */
  readonly output: ChannelConsumer | undefined;
  /** Resolves once every stage exited with status 0; rejects naming the first that did not. */
  done(): Promise<void>;
  /** Kills every stage still running and closes the channels. */
  kill(): void;
}

interface StageMessage {
  [PROTOCOL]: 'stage';
  index: number;
  count: number;
  input: boolean;
  output: boolean;
}

/**
 * Spawns one process per module in `stages` and chains them: stage i's output channel is stage
 * i + 1's input. Each stage calls pipelineStage() to get its ends. Every channel gets the same
 * slots, slot size and memory (`memory: { pool }` gives each channel its own allocation there).
 */
export async function pipeline(stages: ReadonlyArray<string | URL>, options: PipelineOptions): Promise<Pipeline> {
  if (!Array.isArray(stages) || stages.length === 0) throw invalidArgValue('pipeline: give at least one stage module');
  const n = stages.length;
  const spawned: SpawnedChild[] = [];
  const hubs: ChannelHub[] = [];
  const exits: Array<Promise<{ index: number; code: number | null; signal: NodeJS.Signals | null }>> = [];
  const { args, spawn: spawnOptions, input: wantInput, output: wantOutput, wait, spinMicros, ...channelOptions } = options;
  let input: ChannelProducer | undefined;
  let output: ChannelConsumer | undefined;
  // The hubs of this process's own ends: they stay until those ends are closed.
  const ownHubs = new Set<ChannelHub>();
  const killAll = () => {
    for (const s of spawned) if (s.child.exitCode === null && s.child.signalCode === null) s.child.kill('SIGKILL');
  };
  const closeAll = () => {
    for (const h of hubs) h.close();
  };
  try {
    for (let i = 0; i < n; i++) {
      const s = await spawn(stages[i]!, [...(args?.[i] ?? [])], spawnOptions);
      spawned.push(s);
      exits.push(new Promise((resolve) => {
        if (s.child.exitCode !== null || s.child.signalCode !== null) resolve({ index: i, code: s.child.exitCode, signal: s.child.signalCode });
        else s.child.once('exit', (code, signal) => resolve({ index: i, code, signal }));
      }));
    }
    // channels[i] feeds stage i (i = 0: from this process), channels[n] is the last stage's output.
    const channels: Array<ChannelHub | undefined> = [];
    for (let i = 0; i <= n; i++) {
      const first = i === 0;
      const last = i === n;
      if ((first && !wantInput) || (last && !wantOutput)) {
        channels.push(undefined);
        continue;
      }
      const hub = ChannelHub.create({ ...channelOptions, maxPeers: 2 });
      hubs.push(hub);
      channels.push(hub);
      // This process's ends own their hubs: closing one (or end()) closes its channel.
      if (first) input = openOwnedEnd(hub, 'producer', { wait, spinMicros }) as ChannelProducer;
      if (last) output = openOwnedEnd(hub, 'consumer', { wait, spinMicros }) as ChannelConsumer;
      if (first || last) ownHubs.add(hub);
    }
    await Promise.all(spawned.map(async ({ link }, i) => {
      const message: StageMessage = { [PROTOCOL]: 'stage', index: i, count: n, input: channels[i] !== undefined, output: channels[i + 1] !== undefined };
      link.send(message);
      if (channels[i]) await channels[i]!.attach(link, { role: 'consumer' });
      if (channels[i + 1]) await channels[i + 1]!.attach(link, { role: 'producer' });
    }));
  } catch (e) {
    killAll();
    closeAll();
    throw e;
  }
  let settled: Promise<void> | undefined;
  const done = () => {
    settled ??= (async () => {
      try {
        const results = await Promise.all(exits);
        // Name the stages that were killed first: the others usually failed because of them.
        const bad = results.filter((r) => r.code !== 0).sort((a, b) => Number(!a.signal) - Number(!b.signal) || a.index - b.index);
        if (bad.length > 0) {
          const how = (r: (typeof bad)[number]) => (r.signal ? `was killed by ${r.signal}` : `exited with status ${r.code}`);
          const [first, ...rest] = bad;
          throw new IpcError('ERR_PEER_GONE', `pipeline stage ${first!.index} (${String(stages[first!.index])}) ${how(first!)}` +
            rest.map((r) => `; stage ${r.index} ${how(r)}`).join(''));
        }
      } finally {
        for (const s of spawned) s.link.close();
        for (const h of hubs) if (!ownHubs.has(h)) h.close();
      }
    })();
    return settled;
  };
  return {
    stages: spawned,
    input,
    output,
    done,
    kill: () => {
      killAll();
      closeAll();
    },
    [Symbol.asyncDispose]: async () => {
      try {
        await done();
      } finally {
        closeAll();
      }
    },
  };
}

/** What pipelineStage() gives a stage process; `InMeta`/`OutMeta` type its channels' metadata. */
export interface PipelineStage<InMeta = unknown, OutMeta = InMeta> {
  /** This stage's position (0 = first). */
  readonly index: number;
  /** Number of stages. */
  readonly count: number;
  /** Consumer end of the channel into this stage (undefined for a first stage with no feeder). */
  readonly input: ChannelConsumer<SlotBuffer, InMeta> | undefined;
  /** Producer end of the channel out of this stage (undefined for a last stage nobody reads). */
  readonly output: ChannelProducer<SlotBuffer, OutMeta> | undefined;
  /** The link to the process that runs the pipeline (for results, logs, ...). It is unref'd, so
   * that the stage exits once its work is done; link.ref() keeps the process alive for it. */
  readonly link: Link;
}

/**
 * In a stage process started by pipeline(): its input and output channel ends. `InMeta` and
 * `OutMeta` type the metadata of the messages it receives and publishes (not checked at run time).
 */
export function pipelineStage<InMeta = unknown, OutMeta = InMeta>(options?: ChannelWaitOptions & { signal?: AbortSignal }): Promise<PipelineStage<InMeta, OutMeta>>;
export async function pipelineStage(options: ChannelWaitOptions & { signal?: AbortSignal } = {}): Promise<PipelineStage> {
  const link = parentLink();
  const m = (await link.receive({ signal: options.signal })) as Partial<StageMessage> | undefined;
  if (typeof m !== 'object' || m === null || m[PROTOCOL] !== 'stage') {
    throw new IpcError('ERR_FRAME_INVALID', 'pipelineStage: this process was not started as a pipeline stage (the first message was something else)');
  }
  const wait = { wait: options.wait, spinMicros: options.spinMicros, signal: options.signal };
  const input = m.input ? await acceptChannel(link, { ...wait, role: 'consumer' }) : undefined;
  const output = m.output ? await acceptChannel(link, { ...wait, role: 'producer' }) : undefined;
  // Pending channel waits keep the process alive; the link need not.
  link.unref();
  return { index: Number(m.index), count: Number(m.count), input, output, link };
}
