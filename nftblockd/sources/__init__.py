"""Where log lines come from: file tails (tail.py, inotify), the journal (journal.py) and the line splitter
they share (linesplit.py, pure). A source yields LineBatch values and positions; it never matches a line."""
