"""Small pieces every layer uses: JSONL files, progress bars, stopping a notebook, ending a
process at once, ending an asyncio task that absorbs a cancel, theme colours, secret redaction,
eval-row patterns, chat-row rules.
"""
