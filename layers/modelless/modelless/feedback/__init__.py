"""Feedback on answered queries, and online model selection from it (Clipper §5).

``policy``: Exp3 and Exp4, pure functions over explicit weights; ``store``: what feedback keeps
per app (``memory`` and ``redis`` backends); ``service``: the query path's policy step and the
feedback endpoint's logic.
"""
