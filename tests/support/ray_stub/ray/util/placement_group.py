"""Placement groups: STRICT_SPREAD puts bundle i on its own node (the i-th that has the
bundle's GPUs); a group that cannot be placed never becomes ready."""
import ray


class PlacementGroup:
    def __init__(self, bundles, strategy):
        self.bundles, self.strategy = bundles, strategy
        fit = [i for i, n in enumerate(ray._nodes()) if n["gpus"] >= bundles[0].get("GPU", 0)]
        self.nodes = fit[:len(bundles)] if len(fit) >= len(bundles) else None

    def ready(self):
        if self.nodes is None:
            return ray._Never()
        return ray.ObjectRef(value=self)


def placement_group(bundles, strategy="PACK", **_):
    return PlacementGroup(bundles, strategy)


def remove_placement_group(pg):
    pass
