"""The ipywidgets views: RunPicker, ExamplePreviewer, CompareView, CandidateView and the others, each a
view over a DataFrame or a result object, with a static fallback for saved notebooks (see _base).
"""
