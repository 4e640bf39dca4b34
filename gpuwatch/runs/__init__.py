"""A run from outside its supervisor: its folder, starting it, resuming it, exporting it.

``folders.py`` the layout under $GPUWATCH_HOME (ids, sockets, state, listing);
``spawn.py`` whether a run can start from here, and its supervisor started detached;
``environment.py`` the environments gpuwatch starts programs with; ``resume.py`` an ended
run's next attempt; ``export.py`` its events.jsonl as tables. Used by the command line,
the supervisor (folders, environment) and the dashboard (folders, resume); each module is
imported directly (this package re-exports nothing).
"""
