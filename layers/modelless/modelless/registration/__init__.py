"""A model in, its variants out: the service (``service``), reading and checking what was sent
(``ingest``), generating and profiling variants (``profiling``), and profiles measured elsewhere
(``profile_import``). The rules every name and bound is checked by stay in
``modelless.validation``, which the API uses too.
"""
