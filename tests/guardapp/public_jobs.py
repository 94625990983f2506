"""Jobs of the public-copies suite (tests/integration/test_guard_public.py, issue 22).

A tenant's code keeps using its own copies of the apps that are in SHARED_APPS and TENANT_APPS
(ContentType lookups, sessions, users, the admin log), never the operators' copies in public;
and honest ORM code writing a shared table whose ``db_table`` has upper-case letters needs
``global_writes`` like any other shared write.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils import timezone

from kumiko_jobs import EscapeHatch, job
from kumiko_jobs.run.context import JobContext

from .models import Finding, Secret
from .shared.models import Notice


@job
def own_copies(ctx: JobContext) -> None:
    """What Django itself does in tenant code: every lookup goes to the tenant's own copy."""
    ContentType.objects.clear_cache()  # the lookup below reaches the database
    content_type = ContentType.objects.get_for_model(Secret)
    Session.objects.create(
        session_key=f"own{str(ctx.run_id).replace('-', '')[:20]}",
        session_data="x",
        expire_date=timezone.now() + timedelta(days=1),
    )
    seen = {
        "content_type": f"{content_type.app_label}.{content_type.model}",
        "permissions": Permission.objects.filter(content_type=content_type).count(),
        "users": get_user_model().objects.count(),
        "sessions": sorted(Session.objects.values_list("session_key", flat=True)),
        "admin_log": LogEntry.objects.count(),
    }
    Finding.objects.create(key="own_copies", value=json.dumps(seen))


@job
def operators_sessions(ctx: JobContext) -> None:
    """Reads the operators' session keys in public (refused in both modes)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT session_key FROM public.django_session")
        keys = [row[0] for row in cursor.fetchall()]
    Finding.objects.create(key="operators_sessions", value=json.dumps(keys))


@job
def notice_without_grant(ctx: JobContext) -> None:
    """Reads the shared, upper-case-named table (allowed), then writes it (needs the grant)."""
    Finding.objects.create(key="notices", value=str(Notice.objects.count()))
    Notice.objects.create(text="without a grant")


@job(escape_hatch=EscapeHatch(reason="posts a shared notice", grants=["global_writes"]))
def notice_with_grant(ctx: JobContext, *, text: str) -> None:
    with ctx.global_writes():
        Notice.objects.create(text=text)


@job(escape_hatch=EscapeHatch(reason="reads a sister tenant", grants=["cross_tenant_reads"]))
def read_public_as_a_tenant(ctx: JobContext) -> None:
    """``cross_tenant_reads`` of the public tenant: unqualified names would be the operators'."""
    from example_project.customers.models import Client

    public = Client.objects.get(schema_name="public")
    with ctx.cross_tenant_reads(public):
        keys = list(Session.objects.values_list("session_key", flat=True))
    Finding.objects.create(key="operators_sessions", value=json.dumps(keys))
