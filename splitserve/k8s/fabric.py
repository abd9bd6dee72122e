"""The KV fabric between pods: what an engine pod gets for `config.kv_transfer.fabric` (pure).

A disaggregated deployment moves each prompt's KV cache from a prefill pod to a decode pod over
NIXL. Without an RDMA device in the pods, UCX falls back to TCP on the pod network (Dynamo: 1.8 s
against 3 ms for a 5k-token KV of an 8B model, ai-dynamo/dynamo PR 1314); two pods cannot use
NVLink or CUDA IPC between them either (separate containers, their own GPUs). A preset names
what a fabric kind needs in the pod:

    kind        NIXL backend  env (static)                               resources (default)
    tcp         UCX           -                                          -
    infiniband  UCX           UCX_TLS=rc,sm,self,cuda_copy,cuda_ipc      rdma/ib: 1
    roce        UCX           UCX_TLS=rc,sm,self,cuda_copy,cuda_ipc      rdma/rdma_shared_device_a: 1
    efa         LIBFABRIC     FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1  vpc.amazonaws.com/efa: 1
    custom      UCX           -                                          -

plus IPC_LOCK for the RDMA kinds (memory registration pins pages). What depends on the cluster
comes from the chart's `kvFabric` values (`FabricValues`): the resource names and counts (they
depend on the device plugin), UCX_NET_DEVICES, RoCE's UCX_IB_GID_INDEX, extra env, host
networking or a secondary (Multus) network. `fabric_pod(cfg, values)` combines them.

The chart reads the presets from `helm/splitserve/files/kv-fabric-presets.json`, generated from
`PRESETS` (a test fails until it is in sync), and combines them with its values in
`templates/_fabric.tpl` the same way:

    python -m splitserve.k8s.fabric --write
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

from splitserve.config import FabricKind, SplitserveConfig

PRESETS_PATH = (Path(__file__).resolve().parents[2] / "helm" / "splitserve" / "files"
                / "kv-fabric-presets.json")
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
IPC_LOCK = "IPC_LOCK"
# UCX transports for RDMA: RC verbs between nodes (UD for its wire-up), shared memory and
# loopback between the ranks of one pod, and CUDA memory copies (GPU buffers; the NIC reads GPU
# memory directly with GPUDirect RDMA when the node has it).
UCX_RDMA_TLS = "rc,sm,self,cuda_copy,cuda_ipc"


@dataclass(frozen=True)
class Preset:
    """One fabric kind's pod additions: static env, default extended resources per engine pod,
    whether the engine container needs IPC_LOCK, and whether its NIXL backend is UCX (which
    reads the UCX_* settings of `FabricValues`)."""

    env: dict[str, str] = field(default_factory=dict)
    resources: dict[str, int] = field(default_factory=dict)
    ipc_lock: bool = False
    ucx: bool = True


PRESETS: dict[str, Preset] = {
    "tcp": Preset(),
    "infiniband": Preset({"UCX_TLS": UCX_RDMA_TLS}, {"rdma/ib": 1}, ipc_lock=True),
    # NVIDIA Network Operator's RDMA shared device plugin, default resource name.
    "roce": Preset({"UCX_TLS": UCX_RDMA_TLS}, {"rdma/rdma_shared_device_a": 1}, ipc_lock=True),
    # AWS EFA device plugin; set the count to the EFA interfaces of the pod's GPUs (p5: 4 a GPU).
    # NIXL's LIBFABRIC backend (KvTransferConfig.nixl_backend), not UCX.
    "efa": Preset({"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"},
                  {"vpc.amazonaws.com/efa": 1}, ipc_lock=True, ucx=False),
    "custom": Preset(),
}


@dataclass(frozen=True)
class FabricValues:
    """The chart's `kvFabric` values (cluster-specific): `resources` replaces the preset's when
    not empty; `net_devices` -> UCX_NET_DEVICES and `gid_index` -> UCX_IB_GID_INDEX (UCX kinds);
    `ipc_lock` None: the preset's; `env` is appended; `host_network` puts the engine pods on the
    node's network (dnsPolicy ClusterFirstWithHostNet); `networks` is the Multus annotation."""

    resources: dict[str, int | str] = field(default_factory=dict)
    net_devices: str = ""
    gid_index: int | None = None
    ipc_lock: bool | None = None
    env: list[dict] = field(default_factory=list)
    host_network: bool = False
    networks: str = ""

    @classmethod
    def from_values(cls, values: dict) -> FabricValues:
        """From merged chart values (the `kvFabric` section; absent: all defaults)."""
        v = values.get("kvFabric") or {}
        return cls(resources=dict(v.get("resources") or {}),
                   net_devices=str(v.get("netDevices") or ""),
                   gid_index=v.get("gidIndex"), ipc_lock=v.get("ipcLock"),
                   env=list(v.get("env") or []), host_network=bool(v.get("hostNetwork")),
                   networks=str(v.get("networks") or ""))


@dataclass(frozen=True)
class FabricPod:
    """What one engine pod gets: container env, extended resources (requests = limits),
    capabilities to add, host networking and pod annotations. Empty for a deployment without
    KV transfer between pods (colocated)."""

    env: list[dict] = field(default_factory=list)
    resources: dict[str, str] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)
    host_network: bool = False
    annotations: dict[str, str] = field(default_factory=dict)

    def pod_fields(self) -> dict:
        """hostNetwork and dnsPolicy of the pod spec (empty without host networking)."""
        if not self.host_network:
            return {}
        return {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}


def fabric_pod(cfg: SplitserveConfig, values: FabricValues | None = None) -> FabricPod:
    """The engine pods' additions for `cfg`'s fabric and the chart's `kvFabric` values
    (mirrored by the chart's `splitserve.kvFabric`). Colocated: none, no KV crosses pods."""
    if cfg.mode == "colocated":
        return FabricPod()
    v = values or FabricValues()
    preset = PRESETS[cfg.kv_transfer.fabric]
    env = [{"name": k, "value": val} for k, val in sorted(preset.env.items())]
    if preset.ucx and v.net_devices:
        env.append({"name": "UCX_NET_DEVICES", "value": v.net_devices})
    if preset.ucx and v.gid_index is not None:
        env.append({"name": "UCX_IB_GID_INDEX", "value": str(v.gid_index)})
    env += [dict(e) for e in v.env]
    resources = v.resources or preset.resources
    ipc_lock = preset.ipc_lock if v.ipc_lock is None else v.ipc_lock
    return FabricPod(
        env=env,
        resources={name: str(n) for name, n in sorted(resources.items())},
        capabilities=[IPC_LOCK] if ipc_lock else [],
        host_network=v.host_network,
        annotations={MULTUS_ANNOTATION: v.networks} if v.networks else {},
    )


def presets_json() -> str:
    """The chart's presets file: `PRESETS` by kind, as the templates read it."""
    kinds = typing.get_args(FabricKind)
    data = {k: {"env": PRESETS[k].env, "resources": PRESETS[k].resources,
                "ipcLock": PRESETS[k].ipc_lock, "ucx": PRESETS[k].ucx} for k in kinds}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Check (default) or rewrite (--write) the chart's kv-fabric-presets.json."""
    p = argparse.ArgumentParser(prog="python -m splitserve.k8s.fabric", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help="rewrite the file in place")
    args = p.parse_args(argv)
    if args.write:
        PRESETS_PATH.write_text(presets_json())
        return 0
    if not PRESETS_PATH.is_file() or PRESETS_PATH.read_text() != presets_json():
        print(f"{PRESETS_PATH} is out of date: run python -m splitserve.k8s.fabric --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
