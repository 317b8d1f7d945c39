// Types of the addon's CUDA driver functions (native/cuda.cc).
export interface CudaAddon {}
