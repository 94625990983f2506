"""The second wall: one PostgreSQL role per tenant, which the job body logs in as.

Where the classifier (the rest of ``guard``) judges SQL text, these modules make PostgreSQL
itself refuse what a tenant's body may not do (docs/guard.md, "Two walls"):

* ``names``: the roles' names and derived passwords (never stored);
* ``privileges``: creating, granting and dropping the roles (what each may do);
* ``sync``: keeping them in step with the tenants (every one on deploy, each on its hooks);
* ``connections``: the body's logins as its tenant's role (the per-thread pool, the swaps for
  the escape hatches' blocks);
* ``search_path``: a tenant login keeps its ``search_path`` from run to run;
* ``refusals``: PostgreSQL's ``permission denied`` recorded as the run's denial (built by
  ``guard.denials``, as every refusal is).

Imported by module (``from kumiko_jobs.guard.roles import names``); this package exports
nothing itself.
"""

from __future__ import annotations
