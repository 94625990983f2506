"""The enqueue side (enqueue, emit, follow-ups, fan-out); imports definition, transport, core."""
