"""`obsq ui`, the web console: the Inspector's pages and actions over HTTP (Starlette,
Jinja2 and uvicorn, from the `ui` extra). Every asset ships in the package."""

from obsq.ops.ui.app import create_app

__all__ = ["create_app"]
