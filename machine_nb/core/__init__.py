"""Small pieces every layer uses: JSONL files, progress bars, stopping a notebook, ending a
process at once, theme colours, secret redaction, eval-row patterns, chat-row rules.
"""
