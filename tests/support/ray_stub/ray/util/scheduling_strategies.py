"""The scheduling strategy the driver gives its tasks."""


class PlacementGroupSchedulingStrategy:
    def __init__(self, placement_group, placement_group_bundle_index=-1, **_):
        self.placement_group, self.placement_group_bundle_index = placement_group, placement_group_bundle_index
