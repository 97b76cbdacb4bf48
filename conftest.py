pytest_plugins = ["harness.run.pytest_plugin"]
