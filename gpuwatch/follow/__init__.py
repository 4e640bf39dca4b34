"""Following a run from outside it, without Textual: what a dashboard or a script reads.

``client.py`` the asyncio client of a supervisor's socket (events, commands);
``record_reader.py`` an ended run's record (snapshot.json, events.jsonl) read back as a
supervisor would have sent it; ``link.py`` the links a dashboard follows a run through
(socket, record, replay), reconnecting and resubscribing. The dashboard (gpuwatch/app/),
headless mode and ``gpuwatch attach``/``stop`` use them; each module is imported directly
(this package re-exports nothing).
"""
