# Run 105 (session 30): on run 104's machine, lab/gpu_issue48_run11.sh's `sweep` for this tree alone, twice:
# pass 4 with a 150-s limit (the compiled merge's last family compiles), pass 5 warm (45 s).
# The call rewrote the script into /tmp/r11c.sh: its fill line became `sweep new 4 150 5`, the base and loop lines
# were dropped, and `sweep new 5 45 5` was appended; then `OUT=$OUT EXCLUDE='context[flashinfer-fa3]' bash /tmp/r11c.sh`.
sed "s/^sweep new 1 \${FILL:-130} 10$/sweep new 4 \${FILL:-130} 5/; s/^sweep base 1 .*$//" lab/gpu_issue48_run11.sh > /tmp/r11c.sh
echo "sweep new 5 45 5" >> /tmp/r11c.sh
sed -i "s/^for p in .*//; s/^gzip .*//" /tmp/r11c.sh
OUT=$OUT FILL=150 EXCLUDE='context[flashinfer-fa3]' bash /tmp/r11c.sh
