"""The step that leaves the process (http_request) and the guard on where it may connect."""
