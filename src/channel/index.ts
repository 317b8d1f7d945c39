// Public surface of channels.
export { ChannelHub, type AttachOptions } from './hub.js';
export { ChannelProducer, ChannelSlot } from './producer.js';
export { ChannelConsumer, ChannelMessage } from './consumer.js';
export { createChannel, acceptChannel, type CreateChannelOptions, type AcceptOptions } from './create.js';
export {
  type ChannelRole, type ChannelTopology, type ChannelMemory, type ChannelWaitOptions, type ChannelOptions, type WaitMode,
  type SlotBuffer, type SlotBufferFor, type AcquireOptions, type PublishOptions, type PublishArgs, type ReleaseOptions, type ReceiveOptions,
  type ChannelStats, type ChannelShape, type WaitPolicy,
} from './options.js';
export { LIMITS as CHANNEL_LIMITS } from './layout.js';
export { pipeline, pipelineStage, type Pipeline, type PipelineOptions, type PipelineStage } from './pipeline.js';
