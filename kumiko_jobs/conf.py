"""``kumiko_jobs.conf``: the settings reader's old path, for a landed migration.

Migration 0011 (``kumiko_jobs_atomic_success``) reads the public schema's name through
``from kumiko_jobs import conf``, and a migration that has landed is never edited. The
readers themselves are ``core/conf.py`` (``KUMIKO_JOBS``) and ``core/project_settings.py``
(other projects' settings, this one among them); nothing in the package imports this face.
"""

from .core.project_settings import public_schema_name

__all__ = ["public_schema_name"]
