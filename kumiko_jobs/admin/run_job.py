"""The "Run a job…" page: operators enqueue a manual job (``@job(manual=True)``) by hand.

For a tenant or, for a system job, for none; the arguments are a JSON object checked against
the job's signature before anything is written. Operators (``view_all_tenants``) holding the
(otherwise unused) add permission only; the page's URL is added to the run admin's own
(``get_urls``).
"""

from __future__ import annotations

import inspect
import json
import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django_tenants.utils import get_tenant_model

from .. import operations
from ..core import project_settings
from ..core.audience import sees_all_tenants
from ..core.exceptions import KumikoJobsError
from ..core.text import text_problem
from ..definition.job import JobDefinition
from ..definition.registry import registry
from ..enqueueing.validate import MAX_INTEGER_DIGITS, check_json


class RunJobView(admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """The "Run a job…" page of the run admin: its URL, permission and view."""

    def get_urls(self) -> list[URLPattern]:
        """The run admin's URLs plus ``run-job/``, behind the admin site's login check."""
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "run-job/",
                self.admin_site.admin_view(self.run_job_view),
                name="{}_{}_run_job".format(*info),
            ),
            *super().get_urls(),
        ]

    def has_run_job_permission(self, request: HttpRequest) -> bool:
        """Run a manual job: operators (``view_all_tenants``) holding the (otherwise unused) add
        permission."""
        return sees_all_tenants(request) and request.user.has_perm("kumiko_jobs.add_jobrun")

    def run_job_view(self, request: HttpRequest) -> HttpResponse:
        """Show the form and, once it is valid, enqueue the job in one transaction and go to the new
        run's page; a refusal from enqueueing is shown on the form instead.
        """
        if not self.has_run_job_permission(request):
            raise PermissionDenied
        form = RunJobForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                # One transaction: an error after the history row was written leaves neither
                # the row nor (the push waits for commit) a queue message.
                with transaction.atomic():
                    handle = operations.enqueue_manual(
                        form.cleaned_data["definition"],
                        form.cleaned_data["tenant"] or None,
                        form.cleaned_data["arguments"],
                        by=request.user,
                        request_id=form.request_id(),
                    )
            except KumikoJobsError as exc:
                form.add_error(None, str(exc))
            else:
                url = reverse(
                    f"{self.admin_site.name}:kumiko_jobs_jobrun_change",
                    args=[uuid.UUID(handle.run_id)],
                )
                self.message_user(
                    request,
                    format_html(
                        gettext("Queued {job} for {tenant}: run {run}."),
                        job=handle.job_name,
                        tenant=handle.schema_name or gettext("system"),
                        run=format_html('<a href="{}">{}</a>', url, handle.run_id),
                    ),
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(url)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Run a job"),
            "opts": self.opts,
            "form": form,
            "manual_jobs": _manual_job_rows(),
            "has_view_permission": self.has_view_permission(request),
        }
        return TemplateResponse(request, "admin/kumiko_jobs/jobrun/run_job.html", context)


def manual_jobs() -> list[JobDefinition]:
    """The registered jobs declared ``manual=True``: the only ones the page may run."""
    return [d for d in registry if d.manual]


def _signature(definition: JobDefinition) -> str:
    """``invoice_id: int, fail_times: int = 0``, from annotations that may be strings."""
    parts = []
    for param in list(inspect.signature(definition.func).parameters.values())[1:]:
        text = param.name
        if param.annotation is not param.empty:
            annotation = param.annotation
            text += f": {annotation if isinstance(annotation, str) else annotation.__name__}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        parts.append(text)
    return ", ".join(parts)


def _tenants() -> QuerySet[Any]:
    """The project's tenants, without the public schema's row (it is no tenant)."""
    tenants: QuerySet[Any] = get_tenant_model().objects.exclude(
        schema_name=project_settings.public_schema_name()
    )
    return tenants


def _manual_job_rows() -> list[dict[str, Any]]:
    # Plain dicts: templates call callables, and a JobDefinition is callable.
    return [
        {
            "name": d.name,
            "system": d.system,
            "description": d.description,
            "signature": _signature(d),
        }
        for d in manual_jobs()
    ]


class RunJobForm(forms.Form):
    """The job, its tenant (empty for a system job) and its arguments as a JSON object; valid only
    when the arguments bind to the job's signature.

    Up to ``MAX_TENANT_CHOICES`` tenants the tenant is a select; beyond, a text input for the
    schema name, checked against the tenant model with one indexed query: ten thousand options
    would load every tenant row and render a page no one can scroll.
    """

    MAX_TENANT_CHOICES = 100

    job = forms.ChoiceField(label=_("Job"))
    # One per form shown: the run's id is derived from it (operations.enqueue_manual), so the
    # same form submitted twice (a double click, a resent POST) queues the job once.
    request = forms.UUIDField(required=False, widget=forms.HiddenInput)
    tenant = forms.ChoiceField(
        label=_("Tenant"), required=False, help_text=_("Leave empty for a system job.")
    )
    arguments = forms.CharField(
        label=_("Arguments"),
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "spellcheck": "false"}),
        help_text=_('A JSON object of the job\'s keyword arguments, e.g. {"invoice_id": 7}.'),
    )

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.fields["request"].initial = uuid.uuid4()
        job_field = self.fields["job"]
        assert isinstance(job_field, forms.ChoiceField)
        job_field.choices = [
            (d.name, f"{d.name} — {d.description}" if d.description else d.name)
            for d in manual_jobs()
        ]
        # One more than the select may hold: enough to know whether it would overflow.
        tenants = list(_tenants().order_by("schema_name")[: self.MAX_TENANT_CHOICES + 1])
        self.tenant_as_input = len(tenants) > self.MAX_TENANT_CHOICES
        if self.tenant_as_input:
            self.fields["tenant"] = forms.CharField(
                label=_("Tenant"),
                required=False,
                max_length=63,  # PostgreSQL's longest identifier, a schema name's bound
                widget=forms.TextInput(
                    attrs={"placeholder": gettext("schema name"), "spellcheck": "false"}
                ),
                help_text=_("The tenant's schema name. Leave empty for a system job."),
            )
            return
        tenant_field = self.fields["tenant"]
        assert isinstance(tenant_field, forms.ChoiceField)
        tenant_field.choices = [
            ("", "—"),
            *((t.schema_name, f"{t} ({t.schema_name})") for t in tenants),
        ]

    def request_id(self) -> str:
        """The form's request id, or a fresh one for a POST that carried none (a script's)."""
        value = self.cleaned_data.get("request")
        return str(value or uuid.uuid4())

    def clean_tenant(self) -> str:
        """The tenant's schema name, or "" for none. A typed name must be a tenant's (one query
        on the tenant model's unique schema name) and never the public schema, which is no
        tenant; the select offers only tenants, so Django's choice check covered it.
        """
        schema = str(self.cleaned_data.get("tenant") or "").strip()
        if text_problem(schema):
            # One sentence for both problems, so that it is whole in every language
            # (text_problem's phrase is English: the enqueue and the command line use it).
            raise forms.ValidationError(
                gettext(
                    "A schema name cannot contain NUL characters or lone surrogates (text that "
                    "is not valid Unicode)."
                )
            )
        if not schema or not self.tenant_as_input:
            return schema
        if schema == project_settings.public_schema_name():
            raise forms.ValidationError(
                gettext("“%(schema)s” is the public schema, not a tenant's.") % {"schema": schema}
            )
        if not _tenants().filter(schema_name=schema).exists():
            raise forms.ValidationError(
                gettext("No tenant has the schema name “%(schema)s”.") % {"schema": schema}
            )
        return schema

    def clean_arguments(self) -> dict[str, Any]:
        """The arguments as a dict, with a readable error for text that is not a JSON object or is
        nested too deeply to parse.
        """
        text = (self.cleaned_data.get("arguments") or "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                gettext("Not valid JSON: %(error)s") % {"error": exc}
            ) from None
        except RecursionError:
            # json.loads recurses once per nesting level; thousands of levels exhaust the stack
            # before enqueue's own MAX_ARGUMENT_DEPTH check could give its clearer message.
            raise forms.ValidationError(
                gettext("The arguments are nested too deeply; pass ids, not deep structures.")
            ) from None
        except ValueError:
            # Not a JSONDecodeError: Python refuses to read an integer of more digits than
            # sys.get_int_max_str_digits() (4,300), which json.loads turns into a ValueError.
            raise forms.ValidationError(
                gettext(
                    "A number in the arguments has more than %(max)d digits; pass it as a string."
                )
                % {"max": MAX_INTEGER_DIGITS}
            ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(
                gettext('Arguments must be a JSON object, e.g. {"invoice_id": 7}.')
            )
        return value

    def clean(self) -> dict[str, Any]:
        """Check that a system job has no tenant and a tenant job has one, that the arguments bind
        to the job's signature, and hand the job's definition to the view.
        """
        data = super().clean() or {}
        name = data.get("job")
        if not name or name not in registry:
            return data
        definition = registry.get(name)
        data["definition"] = definition
        if definition.system and data.get("tenant"):
            self.add_error("tenant", gettext("A system job runs for no tenant; leave it empty."))
        elif not definition.system and not data.get("tenant"):
            self.add_error("tenant", gettext("Choose the tenant this job runs for."))
        arguments = data.get("arguments")
        if isinstance(arguments, dict):
            try:
                definition.bind_arguments(arguments)
                # The enqueue's own checks (NUL, lone surrogates from \ud800 escapes, integers
                # no JSON reader takes), shown on the field rather than after a failed enqueue.
                check_json(arguments, definition.name)
            except KumikoJobsError as exc:
                self.add_error("arguments", str(exc))
        return data
