"""The environment variables NCCL documents, with the default each one states, for `doctor`'s nccl-env check.

Source: NCCL's user guide, "Environment Variables" (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
its env.rst as of NCCL 2.30; the 2.19 page, docs/archives/nccl_2190, lists the same older names). Every NAME under a
heading there is here; so are the names the page gives as aliases or former names (NCCL_MAX_NRINGS, NCCL_IB_GDR_LEVEL)
and NCCL_NET_MERGE_LEVEL and NCCL_COMM_ID, which the page refers to.

`default` is the value the page states as the default, as NCCL parses it, only where the page states one
unconditionally (not "platform dependent", "1 on IB, 0 on RoCE", "auto-enabled if supported"). Setting a variable to
its default changes nothing. For the `*_DISABLE` switches the page says "define and set to 1 to disable", so 0 is the
same as unset. NCCL_IB_TIMEOUT's default is that of NCCL 2.23 and later (18 in 2.14-2.22, 14 before).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

#: NAME -> the documented default (None: the page states none, or it depends on the platform).
NCCL_VARIABLES: Mapping[str, str | None] = {
    # System configuration
    "NCCL_SOCKET_IFNAME": None, "NCCL_SOCKET_FAMILY": None, "NCCL_SOCKET_MAGIC": None,
    "NCCL_SOCKET_RETRY_CNT": "34", "NCCL_SOCKET_RETRY_SLEEP_MSEC": "100", "NCCL_SOCKET_POLL_TIMEOUT_MSEC": "0",
    "NCCL_SOCKET_NTHREADS": None, "NCCL_NSOCKS_PERTHREAD": None, "NCCL_CROSS_NIC": "2", "NCCL_IB_HCA": None,
    "NCCL_IB_TIMEOUT": "20", "NCCL_IB_RETRY_CNT": "7", "NCCL_IB_GID_INDEX": "-1", "NCCL_IB_ADDR_FAMILY": "AF_INET",
    "NCCL_IB_ADDR_RANGE": None, "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_SL": "0", "NCCL_IB_TC": "0",
    "NCCL_IB_FIFO_TC": None, "NCCL_IB_RETURN_ASYNC_EVENTS": "1", "NCCL_OOB_NET_ENABLE": None,
    "NCCL_OOB_NET_IFNAME": None, "NCCL_UID_STAGGER_THRESHOLD": "256", "NCCL_UID_STAGGER_RATE": "7000",
    "NCCL_NET": None, "NCCL_NET_PLUGIN": None, "NCCL_TUNER_PLUGIN": None, "NCCL_PROFILER_PLUGIN": None,
    "NCCL_ENV_PLUGIN": None, "NCCL_IGNORE_CPU_AFFINITY": "0", "NCCL_CONF_FILE": None, "NCCL_DEBUG": None,
    "NCCL_DEBUG_FILE": None, "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV", "NCCL_DEBUG_TIMESTAMP_FORMAT": None,
    "NCCL_DEBUG_TIMESTAMP_LEVELS": None, "NCCL_COLLNET_ENABLE": "0", "NCCL_COLLNET_NODE_THRESHOLD": "2",
    "NCCL_CTA_POLICY": "DEFAULT", "NCCL_NETDEVS_POLICY": "AUTO", "NCCL_MULTI_RANK_GPU_ENABLE": "0",
    "NCCL_TOPO_FILE": None, "NCCL_TOPO_DUMP_FILE": None, "NCCL_SET_THREAD_NAME": "0",
    # Debugging ("should generally not be set for production code")
    "NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": None, "NCCL_P2P_DIRECT_DISABLE": "0", "NCCL_SHM_DISABLE": "0",
    "NCCL_BUFFSIZE": "4194304", "NCCL_NTHREADS": None, "NCCL_MAX_NCHANNELS": None, "NCCL_MAX_NRINGS": None,
    "NCCL_MIN_NCHANNELS": None, "NCCL_MIN_NRINGS": None, "NCCL_CHECKS_DISABLE": "0", "NCCL_CHECK_POINTERS": "0",
    "NCCL_CHECK_MODE": "DEFAULT", "NCCL_LAUNCH_MODE": "PARALLEL", "NCCL_IB_DISABLE": "0",
    "NCCL_IB_AR_THRESHOLD": "8192", "NCCL_IB_OOO_RQ": "0", "NCCL_IB_QPS_PER_CONNECTION": "1",
    "NCCL_IB_SPLIT_DATA_ON_QPS": "0", "NCCL_IB_CUDA_SUPPORT": None, "NCCL_IB_PCI_RELAXED_ORDERING": "2",
    "NCCL_IB_ADAPTIVE_ROUTING": None, "NCCL_IB_ECE_ENABLE": "1", "NCCL_MEM_SYNC_DOMAIN": "1",
    "NCCL_CUMEM_ENABLE": None, "NCCL_CUMEM_HOST_ENABLE": None, "NCCL_NET_GDR_LEVEL": None, "NCCL_IB_GDR_LEVEL": None,
    "NCCL_NET_GDR_C2C": "1", "NCCL_NET_GDR_READ": None, "NCCL_GDRCOPY_ENABLE": "0", "NCCL_GDRCOPY_FIFO_ENABLE": "1",
    "NCCL_GDRCOPY_SYNC_ENABLE": "1", "NCCL_GDRCOPY_FLUSH_ENABLE": "0", "NCCL_NET_SHARED_BUFFERS": "1",
    "NCCL_NET_SHARED_COMMS": "1", "NCCL_IGNORE_NET_MISMATCH": "1", "NCCL_IGNORE_COLLNET_MISMATCH": "0",
    "NCCL_SINGLE_RING_THRESHOLD": None, "NCCL_LL_THRESHOLD": None, "NCCL_TREE_THRESHOLD": None, "NCCL_ALGO": None,
    "NCCL_PROTO": None, "NCCL_NVB_DISABLE": "0", "NCCL_PXN_DISABLE": "0", "NCCL_P2P_PXN_LEVEL": "2",
    "NCCL_PXN_C2C": "1", "NCCL_RUNTIME_CONNECT": "1", "NCCL_GRAPH_REGISTER": "1", "NCCL_LOCAL_REGISTER": "1",
    "NCCL_LEGACY_CUDA_REGISTER": "0", "NCCL_WIN_ENABLE": "1", "NCCL_SET_STACK_SIZE": "0",
    "NCCL_GRAPH_MIXING_SUPPORT": "1", "NCCL_GRAPH_STREAM_ORDERING": "1", "NCCL_DMABUF_ENABLE": "1",
    "NCCL_P2P_NET_CHUNKSIZE": "131072", "NCCL_P2P_LL_THRESHOLD": "16384", "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "0",
    "NCCL_COMM_BLOCKING": None, "NCCL_CGA_CLUSTER_SIZE": None, "NCCL_MAX_CTAS": None, "NCCL_MIN_CTAS": None,
    "NCCL_NVLS_ENABLE": "2", "NCCL_IB_MERGE_NICS": "1", "NCCL_NET_MERGE_POLICY": "ALL", "NCCL_NET_MERGE_LEVEL": None,
    "NCCL_MNNVL_ENABLE": None, "NCCL_MNNVL_UUID": None, "NCCL_MNNVL_CLIQUE_ID": None, "NCCL_RAS_ENABLE": "1",
    "NCCL_RAS_ADDR": "localhost:28028", "NCCL_RAS_TIMEOUT_FACTOR": "1", "NCCL_LAUNCH_ORDER_IMPLICIT": "0",
    "NCCL_LAUNCH_RACE_FATAL": "1", "NCCL_IPC_USE_ABSTRACT_SOCKET": "1", "NCCL_SYM_GIN_KERNELS_ENABLE": "1",
    "NCCL_COMM_ID": None,
}

#: Names the page lists as removed: NCCL no longer reads them.
REMOVED = {"NCCL_SINGLE_RING_THRESHOLD": "2.3", "NCCL_LL_THRESHOLD": "2.5", "NCCL_TREE_THRESHOLD": "2.5",
           "NCCL_IB_CUDA_SUPPORT": "2.4.0"}

#: NCCL_* names that are not NCCL's but something else's, with where the setting really lives. PyTorch's
#: ProcessGroupNCCL still reads its pre-2.2 names (NCCL_ASYNC_ERROR_HANDLING, NCCL_BLOCKING_WAIT, NCCL_DESYNC_DEBUG)
#: as aliases of the TORCH_NCCL_* ones (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp).
ELSEWHERE = {
    "NCCL_TIMEOUT": "the collective timeout is PyTorch's init_process_group(timeout=...), not an environment "
                    "variable; NCCL_IB_TIMEOUT is the InfiniBand verbs retry timeout",
    "NCCL_ASYNC_ERROR_HANDLING": "PyTorch's deprecated alias of TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "PyTorch's deprecated alias of TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "PyTorch's deprecated alias of TORCH_NCCL_DESYNC_DEBUG",
}
_PYTORCH_ALIASES = {"NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT", "NCCL_DESYNC_DEBUG"}
#: How close a documented name must be to count as "the nearest" (difflib ratio of the parts after `NCCL_`;
#: judgement: TIMEOUT -> IB_TIMEOUT is 0.82, SOCKET_IFACE -> SOCKET_IFNAME 0.88, FOO -> PROTO only 0.5).
NEAREST_CUTOFF = 0.75
_PREFIX = "NCCL_"


def is_pytorch_alias(name: str) -> bool:
    return name in _PYTORCH_ALIASES


def nearest(name: str) -> str | None:
    """The documented NCCL variable whose name is closest to `name`, if any is close."""
    found = difflib.get_close_matches(name.removeprefix(_PREFIX), [known.removeprefix(_PREFIX) for known in
                                      NCCL_VARIABLES], n=1, cutoff=NEAREST_CUTOFF)
    return _PREFIX + found[0] if found else None


def is_default(name: str, value: str) -> bool:
    """True when `value` is the documented default of `name` (compared as NCCL reads it: case-insensitive words,
    integers by value)."""
    default = NCCL_VARIABLES.get(name)
    if default is None:
        return False
    given, wanted = value.strip(), default
    try:
        return int(given, 0) == int(wanted)
    except ValueError:
        return given.upper() == wanted.upper()
