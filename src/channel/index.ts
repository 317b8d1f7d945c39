// Public surface of channels.
export {
  Channel, ChannelSlot, ChannelMessage, createChannel, acceptChannel, CHANNEL_LIMITS,
  type ChannelRole, type ChannelTopology, type ChannelMemory, type ChannelWaitOptions, type ChannelOptions,
  type CreateOptions, type AcceptOptions, type SlotBuffer, type SlotBufferFor, type AcquireOptions, type PublishOptions, type ReleaseOptions, type ReceiveOptions, type ChannelStats,
} from './channel.js';
export { pipeline, pipelineStage, type Pipeline, type PipelineOptions, type PipelineStage } from './pipeline.js';
