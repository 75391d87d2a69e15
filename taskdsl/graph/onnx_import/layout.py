"""Converters of data-movement operators: tiling, depth/space rearrangement, element gathers and scans.
