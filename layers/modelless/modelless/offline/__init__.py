"""Offline batch jobs (docs/ARCHITECTURE.md §6, INFaaS ``offline_query``): run a model-less query over every
object under an S3 prefix, on spare worker capacity, writing one result object per input.

- ``jobs``: what a job is (paths, deterministic output keys and job ids, watched prefixes);
- ``objects``: the object store the inputs and outputs live in (S3 through boto3; in memory);
- ``decoding``: ``.npy``/``.npz`` arrays and PNG/JPEG images into the model's input;
- ``throttle``: the pure pause/resume rule over a worker's reported state (INFaaS §6.3.2);
- ``compute``: where the next batch runs (selection over the live workers, throttled) and the
  invocation itself;
- ``runner``: one job, exactly once per input: lease, fixed input list, done markers,
  conditional writes, resume where it stopped; its parts: ``run_state`` (configuration, report,
  what a run keeps), ``run_plan`` (inputs and pinned variants), ``groups`` (a group of inputs
  from objects to results), ``lease`` (the lease, its keepalive, stalled runners), ``results``
  (the result and summary objects);
- ``service``: job creation, watches, status, running; ``job_validation``: refusals up front;
  ``views``: a job as ``job status`` shows it; ``launchers``: where a job runs (the offline
  function, threads of the gateway); ``child_processes``: a job in a child process, restarted
  when it dies;
- ``events``: S3 ObjectCreated events (manifests, watched prefixes) into jobs.
"""
