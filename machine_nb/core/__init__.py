"""Small pieces every layer uses: JSONL files, progress bars, stopping a notebook, theme colours,
secret redaction, eval-row patterns, chat-row rules.
"""
