"""Follow and stop a run from the caller's thread (core.progress): `watching(on_layer, stop)` around
`Model.run` reports each finished layer, `on_layer(done, total, tokens)`, and raises `Stopped` between layers
(and between a lazy run's query chunks and tiles) once `stop()` returns True. Prefix reuse stays on (it is no
hook), and the forward is the one that computes the maps, not a second one."""
from attn_explorer.core.progress import Stopped, check, layer_done, watching

__all__ = ["Stopped", "watching", "check", "layer_done"]
