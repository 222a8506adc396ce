"""Small pieces every layer uses: JSONL files, progress bars, stopping a notebook, a process's
start-up without the garbage collector's repeated walks and its end at once, ending an asyncio
task that absorbs a cancel, theme colours, secret redaction, eval-row patterns, chat-row rules.
"""
