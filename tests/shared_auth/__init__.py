"""Layout (b): users shared by every tenant (``django.contrib.auth`` in SHARED_APPS only, as
django-tenants documents it), with django-tenant-users' way of saying who belongs where: a user
model whose ``tenants`` many-to-many holds the user's tenants. The package itself is not
installed; ``Member`` has the same field.

``project_settings`` is the example project in this layout (the command-line tests on a new
database); ``settings`` is the test suite's, for ``test_*.py`` here, which run in a pytest process
of their own (``tests/integration/test_admin_shared_auth.py`` starts it): the user model is
fixed for a process.
"""
