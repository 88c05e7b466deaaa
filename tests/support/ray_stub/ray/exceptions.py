"""The Ray exceptions the driver catches."""


class RayError(Exception):
    pass


class RayTaskError(RayError):
    pass


class TaskCancelledError(RayError):
    pass
