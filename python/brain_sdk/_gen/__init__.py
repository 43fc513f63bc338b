"""gRPC stubs of the job master's API, generated from proto/ when the package is built."""
