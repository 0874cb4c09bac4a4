"""Evidence kinds, one module each: how to recognize, parse and (optionally) collect them.

Installed as ``doctor.probes``; registered through the ``mldoctor.probes`` entry points.
"""
