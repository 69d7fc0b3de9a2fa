"""Where an extension's media goes while it is made: appended latents are decoded piece by piece
(stream_decode) and handed to a sink as soon as they are final, so a long result needs no more memory than one
window. Sinks: `FileSink` (the fast save path: uint8 on the device, pinned double buffers, encoder thread, published
complete under its reserved name) and `MemorySink` (frames on the host, for callers that want tensors), both in
media/frame_sinks.py."""

from __future__ import annotations

import torch

from ...media.frame_sinks import audio_under
from .geometry import FPS
from .stream_decode import StreamingAudioDecoder, StreamingVideoDecoder


class ExtensionOutput:
    """append(video latents [1, 24, t, h, w], audio latents [2, 32, ta] or None) in timeline order; finish() -> frames
    written. `locked_wave` [2, N] at the audio VAE's rate: the soundtrack is that waveform (cut to the video's length
    at finish) instead of decoded latents."""

    def __init__(self, c, device, sink, locked_wave: torch.Tensor | None = None):
        self.sink, self.rate = sink, c.audio_rate
        self.video = StreamingVideoDecoder(c.vae, device)
        self.audio = None if locked_wave is not None else StreamingAudioDecoder(c.audio_vae, device)
        self.locked_wave = locked_wave
        self.frames = 0

    def _write(self, chunks) -> None:
        for chunk in chunks:
            self.sink.write(chunk)
            self.frames += int(chunk.shape[0])

    def append(self, video_latents: torch.Tensor, audio_latents: torch.Tensor | None) -> None:
        self._write(self.video.iter_push(video_latents))  # each clip to the sink as soon as it is decoded
        if self.audio is not None and audio_latents is not None:
            wave = self.audio.push(audio_latents)
            if wave.shape[1]:
                self.sink.write_audio(wave, self.rate)

    def finish(self) -> int:
        self._write(self.video.iter_finish())
        if self.audio is not None:
            wave = self.audio.finish()
            if wave.shape[1]:
                self.sink.write_audio(wave, self.rate)
        else:
            self.sink.write_audio(audio_under(self.locked_wave, self.frames, self.rate, FPS), self.rate)
        self.sink.close()
        return self.frames

    def check(self) -> None:
        """Raise now if the sink has failed (a full disk): the caller stops before its next costly step."""
        self.sink.check()

    def abort(self) -> None:
        self.sink.abort()
