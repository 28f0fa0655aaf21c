"""A tiny module so nexus_grep and nexus_glob have code to find."""


def greet(name: str) -> str:
    return f"Hello, {name}!"
