"""NCCL from Python through ctypes (standard library only): device bytes between processes and
machines, the same layer as the Node side's src/nccl. libnccl.so.2 is found at run time
(``load_nccl``: CUDA_IPC_NCCL_LIBRARY, the system's, then PyTorch's wheel copy), each candidate first
loaded in a throw-away process; ``NcclCommunicator`` does point-to-point and broadcast on a stream.

    lib = load_nccl()
    uid = lib.unique_id()                # on one rank; send it to the others
    comm = NcclCommunicator.init(uid, nranks=2, rank=0, device=0)
    comm.send(tensor, tensor.nbytes, peer=1, stream=torch.cuda.current_stream())
    comm.close()                         # on every rank; abort() where a peer may be gone
"""
from .communicator import BroadcastOp, NcclCommunicator, NcclOperation, RecvOp, SendOp
from .errors import NCCL_RESULTS, NcclAttempt, NcclError, NcclUnavailableError, result_name
from .abi import NCCL_UNIQUE_ID_BYTES
from .library import NCCL_LIBRARY_ENV, NcclLibrary, format_version, load_nccl

__all__ = [
    "NcclCommunicator", "NcclOperation", "SendOp", "RecvOp", "BroadcastOp", "NcclError", "NcclUnavailableError", "NcclAttempt",
    "NCCL_RESULTS", "result_name", "NcclLibrary", "load_nccl", "format_version", "NCCL_LIBRARY_ENV", "NCCL_UNIQUE_ID_BYTES",
]
