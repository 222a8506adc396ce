"""Checks and numbers before a paid step: validation, exact token counts, renderers, prices and budgets.
"""
