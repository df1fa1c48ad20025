"""The lab's probes: tuning instruments that time candidates the public dispatch does not expose, to choose
the settings the declared experiments then judge. Never evidence: the site's figures come from run records.

One module a probe, each declaring its question, candidates, shapes and raw outputs as module-level data;
probes/harness.py is what they share (clocks, shapes, the JSON header with its schema version);
probes/rounds.toml indexes every round for the site's lab notebook. No probe imports another.
"""
