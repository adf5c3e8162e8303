"""A model switch frees what the old model's runs kept (issue 24 D, memory).

A long run keeps each layer's q, k and row statistics (api.lazy.LazyAttention): SmolLM2 on 28,000 tokens keeps
gigabytes. The run on screen shares that store with every record a view holds (a redraw is a new record over the
same store), so the store itself is emptied, in place: its tensors go at once, whoever holds the record. The
mosaic drawn from it stays (plain NumPy); a view that asks the store for more gets one line saying why it cannot.
Torch is never imported here: the store's class is taken from the store.

What was freed goes back to the system (`give_back_freed`, at a load once the old model went): glibc's malloc
keeps freed blocks for reuse, and after a long run they were hundreds of MiB the next model's run never needed.
"""
from __future__ import annotations

from typing import Any

def give_back_freed() -> bool:
    """Hand the memory malloc holds free back to the system (glibc's malloc_trim(0), every arena: core.heap);
    False where there is no glibc (macOS, Windows, musl): nothing to do there."""
    from attn_explorer.core import heap  # no torch there

    return heap.give_back()


LET_GO = ("its queries and keys were let go when another model was loaded, to free memory: run the input "
          "again to read them")


def let_go_runs(st: Any) -> None:
    """A load let the session's model go (not pinned): what its runs kept goes too (SessionState.load_model).
    What the view shows is remembered without the model, for a failed load that reads the model again."""
    if st._shown_from is not None:
        st._let_go_from = st._shown_from[1:]
    st._shown_from = None
    let_go_store(st.result)


def came_back(st: Any) -> None:
    """The model a failed load had let go is read again: its view stays as it was; the input runs again only if
    what the view needs was let go with it (a long run's q and k)."""
    r, shown, st._let_go_from = st.result, st._let_go_from, None
    gone = r is None or getattr(getattr(r, "lazy", None), "let_go", False)
    if shown is not None and not gone:
        st._shown_from = (st._model, *shown)
    st.model_loaded.emit(st.info)
    if gone:
        st.request_run()


def let_go_store(r: Any) -> bool:
    """Empty r's lazy store in place (its tensors freed; asking it for a head is one line). False: nothing kept."""
    store = getattr(r, "lazy", None)
    if store is None or getattr(store, "let_go", False):
        return False
    base = next(c for c in type(store).__mro__ if c.__name__ == "LazyAttention")
    layers = list(store.layers)
    shape = (getattr(store, "total", len(layers)), getattr(store, "heads_all", 0) or
             max((int(getattr(x, "heads", 0)) for x in layers), default=0),
             int(getattr(layers[0], "n", 0)) if layers else 0, int(getattr(layers[0], "m", 0)) if layers else 0)
    done = getattr(store, "done", len(layers))
    store.__dict__.clear()
    store.__class__ = _let_go_class(base)
    store.layers, store.gone_shape, store.gone_done = [], shape, done
    return True


_CLASSES: dict = {}


def _let_go_class(base: type) -> type:
    if base not in _CLASSES:
        from attn_explorer.errors import UserError

        class LetGo(base):
            """A store whose tensors were freed at a model switch: its shape stays, every read is one line."""

            let_go = True

            @property
            def shape(self):
                return self.gone_shape

            @property
            def num_layers(self):
                return self.gone_shape[0]

            @property
            def num_heads(self):
                return self.gone_shape[1]

            @property
            def total(self):
                return self.gone_shape[0]

            @property
            def done(self):
                return self.gone_done

            @property
            def bytes_kept(self):
                return 0

            def attention(self, *args, **kw):
                raise UserError(f"this run's maps cannot be read any more: {LET_GO}")

            def window(self, layer):
                return None

            def __repr__(self):
                return f"LazyAttention(let go; shape {self.gone_shape})"

        _CLASSES[base] = LetGo
    return _CLASSES[base]
