pytest_plugins = ["quantverdict.run.pytest_plugin"]
