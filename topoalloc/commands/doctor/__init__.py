"""`topoalloc doctor`: an installation checked end to end on a live cluster, each finding ok, warn or
fail with its fix. Every check is a pure function over the objects `fetch.py` read once (`Facts`),
so each is tested on constructed objects; `command.py` is the thin command around them."""
