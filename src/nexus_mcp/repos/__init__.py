"""Git repositories: the git runner, repository operations and the forge client."""
