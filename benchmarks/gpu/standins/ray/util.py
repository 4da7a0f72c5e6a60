"""``ray.util`` of the ray stand-in (see ``ray/__init__.py``): only what verl touches."""

from __future__ import annotations


def get_node_ip_address(*args, **kwargs):
    from ray import needs_ray

    raise needs_ray("ray.util.get_node_ip_address")
