"""A cron job ticking every second, for test_chaos_cron's scheduler processes only.

Installed by tests/chaos/settings.py when ``KUMIKO_CHAOS_EVERY_SECOND=1`` (the schedulers that
test starts), never in the suite's own process: a 1-second cron there would add a tick every
second to the queue of every other test that runs a scheduler.
"""
