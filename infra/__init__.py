"""Infrastructure, by job: ``local/`` (the embedded stack, its demo and the local Lambda tier's
containers), ``aws/`` (the EC2 worker instances' boot and drain scripts and systemd units),
``build/`` (the Lambda artifacts' checks, publishing the worker package), ``zoo/`` (the model zoos
trained here). Not shipped: nothing here runs in Lambda or on a worker."""
