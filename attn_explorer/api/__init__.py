"""What a user of `ax.load_model(...).run(...)` touches: the model, its results, its inputs."""
# your own analyses (plain Python, no torch); `ax.analyses()` lists them. The list function is not bound here:
# its name would hide the submodule attn_explorer.api.analyses
from attn_explorer.api.analyses import register_analysis, unregister_analysis

__all__ = ["register_analysis", "unregister_analysis"]
