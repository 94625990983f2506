"""The enqueue side: a call becomes a run row and a message.

May import the definitions, the transport and the foundation; nothing of the run side.
"""
