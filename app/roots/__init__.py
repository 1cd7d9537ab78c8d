"""The composition roots: one per process kind, each building only what its process runs.

`api`, `sweeper`, `dispatcher` and `bridge` are the separate processes; `serve` is the API with
the sweeper and the push dispatcher in one process. The roots are the only modules, besides the
CLI, that import the entry points (app.api, app.bridge, app.dispatch, app.sweeper); no entry
point imports a root (pyproject.toml's import contracts).
"""
