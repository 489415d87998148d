"""Model runner, workers and executors: the runtime behind the Executor protocol."""
