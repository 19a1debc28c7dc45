"""What every layer of addnorm leans on and no user needs to import: argument checks
(:mod:`.checks`), memory limits and estimates of what a device holds (:mod:`.memory`), and
files read and written without trusting them (:mod:`.files`)."""
