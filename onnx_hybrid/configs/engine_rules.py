"""Engine-time rules: what ``og.Engine`` checks for dynamic batching (docs/genai-config.md#engine-rules)."""

from __future__ import annotations

from ..ops.contract import MS_DOMAIN, PAGED_ATTENTION
from .findings import ENGINE, ERROR, WARNING, Finding, Report
from .graph_io import GraphIO
from .locations import FIXED_KINDS, binding_path
from .parse import GROUPS_PATH, decoder_section
from .provider_rules import uses_cuda
from .state_groups import PAGED_KV, StateGroup, StateManifest, expand


def check_engine(config: dict, manifest: StateManifest | None, graph: GraphIO, report: Report) -> None:
    engine_section = config.get("engine")
    engine = engine_section.get("dynamic_batching") if isinstance(engine_section, dict) else None
    decoder = decoder_section(config)
    groups = manifest.groups if manifest else ()
    paged = [(i, g) for i, g in enumerate(groups) if g.kind == PAGED_KV]

    def finding(rule: str, path: str, message: str, severity: str = ERROR, **kw) -> None:
        report.add(Finding(rule, ENGINE, path, message, severity=severity, **kw))

    if not isinstance(engine, dict):  # not for og.Engine: runtimes.py notes what runs it
        if len(paged) > 1:
            finding("engine.paged_groups", GROUPS_PATH,
                    "Dynamic batching requires exactly one paged_kv decoder state group", severity=WARNING,
                    expected=1, actual=len(paged))
        return
    if "num_blocks" not in engine:
        on_gpu = _cuda_only_pool(paged, graph) or uses_cuda(decoder.get("session_options") or {})
        _check_runtime_sized_pool(engine, on_gpu, finding)
    for key in ("num_hidden_layers", "num_key_value_heads", "head_size"):
        value = decoder.get(key, 0)
        if not isinstance(value, int) or value <= 0:
            finding("engine.geometry", f"model.decoder.{key}",
                    f"Dynamic batching requires model.decoder.{key} to be greater than zero.", actual=value)
    if len(paged) != 1:
        finding("engine.paged_groups", GROUPS_PATH,
                "Dynamic batching requires exactly one paged_kv decoder state group", expected=1, actual=len(paged))
    if paged:
        _check_paged_pool(paged[0][1], engine, decoder, graph, finding)
    for index, group in enumerate(groups):
        binding = group.bindings.get("state") if group.kind in FIXED_KINDS else None
        for layer in group.layer_ids if binding else ():
            state = graph.inputs.get(expand(binding.input, layer))
            if state is not None and state.rank and state.shape[0] >= 0:
                finding("engine.fixed_batch", binding_path(report.form, index, group.kind, "state", "input"),
                        "Dynamic batching requires fixed decoder state groups with a dynamic batch axis, but this "
                        f"model declares a fixed (static) batch dimension of {state.shape[0]}", tensor=state.name,
                        expected="symbolic batch", actual=state.describe())
    position_name = (decoder.get("inputs") or {}).get("position_ids", "position_ids")
    position = graph.inputs.get(position_name)
    packed_geometry = position is not None and position.dtype == "int64" and (
        position.shape == (-1,) or (position.rank == 2 and position.shape[0] == 3 and position.shape[1] < 0))
    if groups and position is not None and not packed_geometry:
        finding("engine.position_ids", "model.decoder.inputs.position_ids",
                "Packed hybrid execution requires position_ids with dynamic int64 [num_tokens] or [3, num_tokens] "
                "geometry", tensor=position.name, expected="int64 [num_tokens] or [3, num_tokens]",
                actual=position.describe())


def _check_runtime_sized_pool(engine: dict, on_gpu: bool, finding) -> None:
    """Without num_blocks, og.Engine 0.18 sizes the pool as gpu_utilization_factor x 0.9 x the device memory
    it reports free. The factor has no usable default (measured on CPU and on an H100: without it the budget is
    zero), and on CPU the memory it reports is no real bound (a factor of 1e-3 already fails to allocate)."""
    factor = engine.get("gpu_utilization_factor")
    if factor is None:
        finding("engine.num_blocks", "engine.dynamic_batching",
                "engine.dynamic_batching sets neither num_blocks nor gpu_utilization_factor: og.Engine fails with "
                "'The key-value cache budget is too small to hold the reserved decoder state.'",
                expected="num_blocks, or gpu_utilization_factor on a GPU")
    elif not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        finding("engine.gpu_utilization_factor", "engine.dynamic_batching.gpu_utilization_factor",
                "gpu_utilization_factor must be > 0 and <= 1", actual=factor)
    elif not on_gpu:
        finding("engine.num_blocks", "engine.dynamic_batching.num_blocks",
                "the pool is sized by gpu_utilization_factor, but the export runs on the CPU: there "
                "og.Engine sizes it from memory it cannot hold (std::bad_alloc); set num_blocks", severity=WARNING)


def _cuda_only_pool(paged: list[tuple[int, StateGroup]], graph: GraphIO) -> bool:
    """Whether com.microsoft::PagedAttention (CUDA only) writes the pool: the runtime can then size it from the
    GPU's memory (with gpu_utilization_factor)."""
    for _, group in paged:
        binding = group.bindings.get("key")
        for layer in group.layer_ids if binding else ():
            producer = graph.producers.get(expand(binding.output, layer))
            if producer and producer[:2] == (PAGED_ATTENTION.name, MS_DOMAIN):
                return True
    return False


# Per pool axis: its name, the runtime's message tail, and the config field it is compared with.
_POOL_AXES = (
    ("num_blocks", " for the full-context paged cache pool.", "engine.dynamic_batching.num_blocks"),
    ("block_size", " from engine.dynamic_batching.block_size.", "engine.dynamic_batching.block_size"),
    ("num_key_value_heads", " from model.decoder.num_key_value_heads.", "model.decoder.num_key_value_heads"),
    ("head_size", " from model.decoder.head_size.", "model.decoder.head_size"),
)


def _check_paged_pool(group: StateGroup, engine: dict, decoder: dict, graph: GraphIO, finding) -> None:
    expected_axes = [engine.get("num_blocks", -1), engine.get("block_size", 256),
                     decoder.get("num_key_value_heads", -1), decoder.get("head_size", -1)]
    for sem, binding in group.bindings.items():
        for layer in group.layer_ids:
            for name, table in ((expand(binding.input, layer), graph.inputs),
                                (expand(binding.output, layer), graph.outputs)):
                tensor = table.get(name)
                if tensor is None or tensor.shape is None:
                    continue
                if tensor.rank != 4:
                    finding("engine.paged_pool", GROUPS_PATH,
                            f"Paged cache tensor '{name}' for layer {layer} must have rank 4 [num_blocks, block_size, "
                            f"num_key_value_heads, head_size]; got rank {tensor.rank} with shape "
                            f"{tensor.runtime_dims()}.",
                            tensor=name, actual=tensor.describe())
                    continue
                for axis, ((axis_name, source, path), want, got) in enumerate(
                        zip(_POOL_AXES, expected_axes, tensor.shape)):
                    if isinstance(want, int) and want >= 0 and got >= 0 and got != want:
                        finding("engine.paged_pool", path,
                                f"Paged cache tensor '{name}' for layer {layer} has incompatible axis {axis} "
                                f"({axis_name}): graph dimension {got}; expected {want}{source}",
                                tensor=name, expected=want, actual=got)
