"""The run side (one attempt, message to history); imports every layer below it, none above."""
