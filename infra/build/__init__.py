"""Build tools: the Lambda layer's and functions' packages (lambda_package, which sam build runs
through the Makefile) and the checks of what sam build produced, publishing the EC2 worker package."""
