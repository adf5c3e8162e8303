"""The functions the session's model jobs run in a worker thread: load, run (and prepare the grid), sweep step.

They import the model package (and with it torch) lazily, so the window can appear before torch is
loaded. What they return is plain data and NumPy arrays; the model object itself only ever travels
back to the GUI thread as an opaque handle for the next job.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from attn_explorer.api.result import ModelInfo, RunResult
from attn_explorer.budget import attention_maps_bytes, human_bytes
from attn_explorer.session.stacks import stack_maps
from attn_explorer.session.torch_setup import configure_torch

DEFAULT_TEXT_MODEL = "minilm"

# loader(src, device, progress, want_image) -> Loaded. src None means "the default model".
Loader = Callable[..., "Loaded"]


@dataclass
class Loaded:
    """What a load job hands back to the GUI thread."""

    model: Any  # the model object (holds torch tensors); only ever used from worker threads
    info: ModelInfo
    builtins: list[tuple[str, str]] = field(default_factory=list)  # (name, description)


@dataclass
class Ran:
    """One run of the model, with the grid page's mosaic already pooled and where its time went."""

    result: RunResult  # its grid mosaic in `display`
    started: float  # perf_counter when the job began
    forward_done: float  # perf_counter when Model.run returned (forward pass, tokenising, copy-out)
    ended: float  # perf_counter when the mosaic was ready
    fit_tokens: int | None = None  # text: the most tokens that fit in memory now, as the run keeps them: maps, or
    # for a model that runs long inputs lazily their q and k (None: no limit known)
    cut: str = ""  # why the text was cut, in words, when it was ("" when nothing was cut)


def memory_budget(device: Any) -> int:
    """Bytes a run's attention maps may take now (the rule Model.run refuses by; tests replace it)."""
    from attn_explorer.budget import default_budget

    return default_budget(device)


def fit_tokens(info: ModelInfo, budget: int, elem: int = 4) -> int:
    """The most tokens whose L·H·n²·elem bytes of attention maps fit in `budget`."""
    per = max(1, info.num_layers * info.num_heads * elem)
    n = int((max(0, budget) / per) ** 0.5)
    while n > 0 and attention_maps_bytes(n, info.num_layers, info.num_heads, elem=elem) > budget:
        n -= 1
    return n


def runs_lazily(model: Any) -> bool:
    """Whether the model can keep q and k instead of its maps for a long input (Model.run's `lazy`): then what
    must fit in memory is what it keeps, not L·H·n² maps. Encoder-decoders keep their maps."""
    import inspect

    run = getattr(model, "run", None)
    try:
        takes = "lazy" in inspect.signature(run).parameters
    except (TypeError, ValueError):
        takes = False
    return takes and not model.info.encoder_decoder


def kept_fit_tokens(model: Any, budget: int) -> int:
    """The most tokens whose lazy run's q, k and row statistics (api.lazy.kept_bytes) fit in `budget`."""
    from attn_explorer.api.lazy import kept_bytes

    info: ModelInfo = model.info
    shape = getattr(model, "_head_shape", None)
    H, H_kv, d = shape() if callable(shape) else (info.num_heads, info.num_heads, info.hidden_size // info.num_heads)
    elem = int(getattr(getattr(model, "dtype", None), "itemsize", 4) or 4)
    per = max(1, kept_bytes(1, 1, info.num_layers, H, H_kv, d, elem))  # linear in n
    return int(max(0, budget) // per)


def default_loader(src: str | None, device: str = "auto", progress=None, want_image: bool = False,
                   dtype: str = "float32") -> Loaded:
    """Load through the public model API."""
    import attn_explorer as ax

    if not src:
        src = ax.default_image_model() if want_image else DEFAULT_TEXT_MODEL
    model = ax.load_model(src, device=device, progress=progress, dtype=dtype)
    builtins = [(str(n), str(d)) for n, d in ax.builtin_models()]
    return Loaded(model=model, info=model.info, builtins=builtins)


def load_job(loader: Loader, src: str | None, device: str, want_image: bool, progress=None,
             dtype: str = "float32", old: Any = None) -> Loaded:
    """old: a weak reference to the model this load let go (ModelHost.load), or None."""
    configure_torch()
    drop_kept_prefix(old)
    kw = {} if dtype == "float32" else {"dtype": dtype}  # loaders that know no dtype still load float32
    return loader(src, device=device, progress=progress, want_image=want_image, **kw)


def pinned_job(loaded: Loaded, old: Any = None) -> Loaded:
    """A switch back to a pinned model: it is in memory already (the old model's kept prefix goes all the same)."""
    drop_kept_prefix(old)
    return loaded


def drop_kept_prefix(old: Any = None) -> None:
    """A load begins: the old model's kept prefix (api.prefix: its KV cache, last hidden state and maps, about
    380 MB for 8,192 SmolLM2 tokens) is dropped before the new weights are read, so the two never sit in memory
    together; a new module could not reuse it anyway (issue 24). `old`: a weak reference to the model the load
    let go. Its last reference frees it (no cycle holds a Model); were one to, a full collection frees it here.
    Otherwise only the young generations are collected: a full collection costs 0.2 s in the app's process and
    took 5-7 s a load late in the test suite's (a third of the suite's time)."""
    import gc
    import sys

    # never imported: nothing was kept (and the first load must not import torch before its loader does)
    prefix = sys.modules.get("attn_explorer.api.prefix")
    if prefix is not None and prefix.kept_tokens():
        prefix.forget()
    if prefix is not None:  # a model ran: what the session let go (the old model, its runs' q and k) is freed now
        workers = sys.modules.get("attn_explorer.session.workers")
        if workers is not None:  # the old model's side jobs, stopped by the switch, end first
            workers.await_stopped(1.0)
        if old is not None and old() is not None:
            gc.collect()
        else:
            gc.collect(1)
        from attn_explorer.session.memory import give_back_freed

        give_back_freed()  # what the old model and its runs held goes back to the system, not kept by malloc


def pool_job(r: RunResult, hide_special: bool = False, stack: str = "encoder") -> RunResult:
    """`r` with the grid's mosaic (api.display.GridImage) of `stack` ("encoder", "decoder" or "cross" of
    an encoder-decoder: session.stacks.stack_maps) in `display`, without the special tokens' rows and
    columns when `hide_special`. Alone, it redraws a result on screen whose drawing options changed: a
    new record sharing r's arrays, so the one on screen never changes under a view."""
    from attn_explorer.api.display import grid_image

    configure_torch()
    if getattr(r, "is_lazy", False):
        # a long input's maps were not kept: the grid fills its mosaic in from q and k in its own lane, head by
        # head with progress (session.long_view.overview_job), so the run itself is not held up by L·H pools
        return dataclasses.replace(r, display=None)
    m = stack_maps(r, stack)
    sinks = getattr(r, "sinks", None) if m.stack == "encoder" else None
    if sinks is not None:  # gpt-oss: each cell's first column is the rows' share given to the learned sink
        grid = grid_image(m.attentions, drop=m.row_special if hide_special else None, sinks=sinks)
    elif not hide_special:
        grid = grid_image(m.attentions)
    elif m.square:
        grid = grid_image(m.attentions, drop=m.row_special)
    else:
        grid = grid_image(m.attentions, drop=m.row_special, drop_cols=m.col_special)
    return dataclasses.replace(r, display=dataclasses.replace(grid, stack=m.stack))


def layer_message(done: int, total: int, tokens: int) -> str:
    """What run_job's progress callback carries besides the fraction: "done/total/tokens" (parse_layers)."""
    return f"{done}/{total}/{tokens}"


def parse_layers(message: str) -> tuple[int, int, int] | None:
    """(layers done, layers in all, tokens) from a layer_message; None for anything else."""
    parts = message.split("/")
    return tuple(int(p) for p in parts) if len(parts) == 3 and all(p.isdigit() for p in parts) else None


def run_job(model: Any, x: Any, kwargs: dict, hide_special: bool = False, stack: str = "encoder",
            progress: Callable[[float, str], None] | None = None, partial: Callable[[Any], None] | None = None) -> Ran:
    """Run the model and pool its attention for the grid, in the same worker job.

    Text longer than the memory allows is cut to the first tokens that fit, with a note, instead of being
    refused: a model switch carries a long text over this way. What must fit is what the run keeps: all
    L·H·n² maps, or, for a model that runs long inputs lazily, each layer's q, k and row statistics (then the
    cut is usually the model's own positions).

    partial: where a long (lazy) run sends each finished layer (session.live_run.LivePart: the run so far, that
    layer's heads pooled into the grid's mosaic) while later layers run; its whole mosaic then comes with it."""
    configure_torch()
    t0 = time.perf_counter()
    info: ModelInfo = model.info
    fit, budget, limit = None, 0, None
    if info.modality == "text":
        dtype = getattr(model, "dtype", None)
        elem = int(getattr(dtype, "itemsize", 4) or 4)
        budget = memory_budget(info.device)
        # a lazy run keeps q and k, not the maps: the n slider and the cut reach what those fit
        fit = kept_fit_tokens(model, budget) if runs_lazily(model) else fit_tokens(info, budget, elem)
        asked = kwargs.get("max_tokens") or info.max_positions
        if fit < min(asked, info.max_positions):
            limit = max(fit, info.min_tokens)
            kwargs = {**kwargs, "max_tokens": limit}
    if info.modality == "text" and _reuses_prefix(model):
        kwargs = {**kwargs, "reuse_prefix": True}  # an edit reruns only the tokens from the first changed one
    from attn_explorer.core.progress import watching

    def layer_done(done: int, total: int, tokens: int) -> None:  # from the forward's own layer loop (issue 24)
        if progress is not None:  # the worker's callback: it also raises Cancelled once the job was stopped
            progress(done / max(1, total), layer_message(done, total, tokens))

    live = None
    if partial is not None and stack == "encoder" and info.modality == "text":
        from attn_explorer.session.live_run import LiveFill

        live = LiveFill(model, x, kwargs, partial)
    with watching(on_layer=layer_done, on_kept=live):  # the job's stop flag (workers.launch): the outer watcher's
        r = model.run(x, **kwargs)
    t1 = time.perf_counter()
    cut = ""
    if r.grid is None and r.total_tokens > r.num_tokens:
        if limit is not None and r.num_tokens == limit:
            kept = "queries and keys" if runs_lazily(model) else "attention maps"
            cut = (f"the {kept} of more than {limit:,} tokens would not fit in the "
                   f"{human_bytes(budget)} of memory that can be spared now")
            r.notes = [n for n in r.notes if not n.startswith("input truncated")] + [
                f"input cut to its first {limit:,} of {r.total_tokens:,} tokens: {cut}"]
        elif kwargs.get("max_tokens") is not None and r.num_tokens == kwargs["max_tokens"] < info.max_positions:
            cut = "the n slider"
        else:
            cut = f"{info.name} reads at most {info.max_positions:,} tokens"
    r = pool_job(r, hide_special, stack)
    grid = live.final_grid(r) if live is not None else None
    if grid is not None:  # every layer's cells were filled in as it ran: the grid's lane has nothing left to do
        r = dataclasses.replace(r, display=grid)
    if getattr(r, "is_lazy", False):  # a long run's freed tiles and activations go back to the system (issue 24 D)
        from attn_explorer.session.memory import give_back_freed

        give_back_freed()
    return Ran(result=r, started=t0, forward_done=t1, ended=time.perf_counter(), fit_tokens=fit, cut=cut)


def _reuses_prefix(model: Any) -> bool:
    """Whether model.run takes reuse_prefix (the public API's models do; a test's stand-in may not)."""
    from attn_explorer.api.model import Model

    return isinstance(model, Model)


def sweep_job(model: Any, x: Any, kw: dict, want: int, reps: int) -> tuple[int, float, bool]:
    """One timed forward pass at sequence length `want`. Text shorter than `want` tokens is repeated
    `reps` times (more if that was too few) and cut with max_tokens. Returns (n, forward ms, repeated)."""
    configure_torch()
    if "max_tokens" not in kw:  # image: the size is already in kw
        r = model.run(x, **kw)
        return r.num_tokens, float(r.forward_ms), False
    while True:
        text = " ".join([x] * reps)
        r = model.run(text, **kw)
        if r.num_tokens >= want or r.total_tokens > r.num_tokens or reps >= 1 << 14:
            return r.num_tokens, float(r.forward_ms), reps > 1
        reps *= 2


def dtype_error_job(model: Any, x: Any, kw: dict) -> dict:
    """How far a 16-bit model's maps and last hidden state are from float32 on input x with the run's
    keyword arguments (Model.dtype_error: the checkpoint again in float32 as the reference). Plain numbers."""
    configure_torch()
    return dict(model.dtype_error(x, **kw))
