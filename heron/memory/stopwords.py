"""The words a query's search leaves out (recall's `terms`), and that a code's seam never
follows (heron/memory/codes.py): the commonest English words, which say nothing of what a
message is about."""

from __future__ import annotations

_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is
it its itself just me more most my myself no nor not now of off on once only or other our
ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself
yourselves s t don didn doesn isn wasn weren won ll ve re d m o y also ever much many kind
like thing things get got
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
