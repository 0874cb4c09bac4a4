"""``mldoctor tui``: a keyboard-first view over the same engine and report model as the CLI.

Layout: ``session`` (the model: where the evidence comes from, the user's answers, the latest
report; no textual import), ``questions`` (the walkthrough's questions as data), ``views`` (pure
text builders for every pane), and the textual widgets: ``app``, ``guide``, ``findings``,
``browser`` and ``dialogs``. Nothing here decides a cause: the engine does, the TUI shows it.
"""
