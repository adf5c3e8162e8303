"""What a user of `ax.load_model(...).run(...)` touches: the model, its results, its inputs."""
